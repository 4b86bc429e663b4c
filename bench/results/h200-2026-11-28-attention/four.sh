#!/bin/bash
# torch's three allocators and vmm, quick gpt2 / llama / vit, three rounds in alternating
# order, every process on cores 0-7: the window's four.sh, run again now that
# bench/torch_allocators.py runs attention off cuDNN by default (what ran was a copy of it).
# bash four.sh [NAME]: NAME.json and NAME.log under $OUT (default four).
exec bash "$(dirname "$0")/../h200-2026-11-28-window/four.sh" "$@"
