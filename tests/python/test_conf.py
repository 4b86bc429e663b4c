"""VMM_CONF: PYTORCH_CUDA_ALLOC_CONF's form for every option of vmm.torch.use()."""

import pytest

import vmm
from vmm import _conf

GIB = 1 << 30


def test_every_option_is_parsed():
    assert _conf.parse("max_size:40G,headroom:0.0078,release_threshold:8GiB") == {
        "max_size": 40 * GIB,
        "headroom": 0.0078,
        "release_threshold": 8 * GIB,
    }
    assert _conf.parse(" release_threshold : none ") == {"release_threshold": None}
    assert _conf.parse("large_page_size:256MiB") == {"large_page_size": 256 << 20}
    assert _conf.parse("") == {} and _conf.parse(None) == {}
    assert set(_conf.KEYS) == {"max_size", "release_threshold", "headroom", "large_page_size"}


@pytest.mark.parametrize(
    "text, named",
    [
        ("max_sizes:1G", 'unknown key "max_sizes"'),
        ("max_size:1G\x01", r"max_size:1G\\x01"),  # a control byte is shown escaped
        ("headroom:0.5x", "headroom:0.5x"),
        ("headroom:+0.5", "headroom:\\+0.5"),
        ("max_size", "is not key:value"),
        ("max_size:", "is not key:value"),
        ("max_size:1G,,headroom:0.1", "is not key:value"),
        ("max_size:lots", "max_size:lots"),
        ("max_size:-1", "max_size:-1"),
        ("headroom:2", "headroom:2"),
        ("headroom:nan", "headroom:nan"),
        ("release_threshold:1X", "release_threshold:1X"),
        ("max_size:1G,max_size:2G", "max_size is given twice"),
        ("large_page_size:3MiB", "large_page_size 3145728 is not a power of two up to 1GiB"),
        ("large_page_size:2GiB", "large_page_size 2147483648 is not a power of two up to 1GiB"),
        ("large_page_size:big", "large_page_size:big"),
        ("large_page_size:64M,large_page_size:64M", "large_page_size is given twice"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(text, named):
    with pytest.raises(vmm.InvalidArgumentError, match=named) as refused:
        _conf.parse(text)
    assert "VMM_CONF" in str(refused.value)


def test_a_bad_vmm_conf_fails_the_import_naming_it(scenario):
    done = scenario("", env={"VMM_CONF": "headroom:0.1,max_sise:1G"}, expect_ok=False)
    assert done.returncode != 0 and "max_sise" in done.stderr and "InvalidArgumentError" in done.stderr, done


def test_vmm_conf_configures_the_resources_and_arguments_override_it(scenario):
    scenario(
        """
        from vmm import _vmm
        vmm.torch._configure()  # VMM_CONF's max_size: 8 MiB
        try:
            _vmm.allocate(16 << 20, 0)
        except vmm.OutOfMemoryError:
            pass
        else:
            raise AssertionError("VMM_CONF's max_size did not apply")
        """,
        env={"VMM_CONF": "max_size:8MiB"},
    )
    scenario(
        """
        from vmm import _vmm
        vmm.torch._configure(max_size=64 << 20)  # the argument wins over VMM_CONF
        _vmm.deallocate(_vmm.allocate(16 << 20, 0), 16 << 20, 0)
        """,
        env={"VMM_CONF": "max_size:8MiB"},
    )


def test_large_page_size_sets_the_pages_of_large_allocations(scenario):
    # 512 MiB of one allocation: 16 pages of the default 32 MiB; 4 of 128 MiB, from VMM_CONF
    # or from the argument; the pages are what share() exports, a descriptor each.
    code = """
        from vmm import _sharing, _vmm
        vmm.torch._configure({argument})
        ptr = _vmm.allocate(512 << 20, 0)
        handle = _sharing._share_allocation(ptr, 512 << 20, 0)
        assert len(handle.fds) - 1 == {pages}, len(handle.fds)
        handle.close()
        _vmm.deallocate(ptr, 512 << 20, 0)
        """
    scenario(code.format(argument="max_size=1 << 30", pages=16))
    scenario(code.format(argument="", pages=4), env={"VMM_CONF": "large_page_size:128MiB"})
    scenario(code.format(argument="large_page_size=128 << 20", pages=4), env={"VMM_CONF": "large_page_size:64MiB"})


def test_a_bad_large_page_size_is_refused_before_any_resource_is_made(scenario):
    scenario(
        """
        from vmm import _vmm
        for bad, named in ((3 << 20, "large_page_size 3145728 is not a power of two"), (-1, "large_page_size")):
            try:
                vmm.torch._configure(large_page_size=bad)
            except vmm.InvalidArgumentError as error:
                assert named in str(error), error
            else:
                raise AssertionError(f"large_page_size={bad} was taken")
        vmm.torch._configure(large_page_size=1 << 20)  # a power of two below the granularity
        try:
            _vmm.allocate(4096, 0)
        except vmm.InvalidArgumentError as error:
            assert "large_page_size 1048576 is not the granularity" in str(error), error
        else:
            raise AssertionError("a large page below the granularity was taken")
        """
    )


def test_the_launcher_runs_an_unmodified_program_with_vmm_as_torchs_allocator(tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no GPU visible to PyTorch: vmm.torch.use() needs CUDA")
    import subprocess
    import sys

    program = tmp_path / "program.py"
    program.write_text(
        "import sys, torch, vmm.torch\n"
        "assert vmm.torch.is_used()\n"
        "x = torch.ones(1 << 20, device='cuda')\n"
        "assert vmm.torch.memory_allocated() >= 4 << 20\n"
        "print('args', sys.argv[1:])\n"
        "sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "vmm.torch.run", str(program), "a", "--b"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "VMM_CONF": "headroom:0.0078"},
    )
    assert done.returncode == 3 and "args ['a', '--b']" in done.stdout, done


def test_blanks_around_keys_and_values_and_case_of_none_are_accepted():
    assert _conf.parse("  ") == {}
    assert _conf.parse("release_threshold:NONE, headroom : 1 ,max_size:\t4096") == {
        "release_threshold": None,
        "headroom": 1.0,
        "max_size": 4096,
    }
