// Maps host memory through an installed vmm and checks what it reads back.
#include <cstdio>
#include <cstring>
#include <string_view>

#include <vmm/address_range.hpp>
#include <vmm/ipc/fd_channel.hpp>
#include <vmm/mapping.hpp>
#include <vmm/physical_allocation.hpp>
#include <vmm/version.hpp>

int main() {
  auto provider = vmm::provider_for(vmm::location::os_host());
  vmm::address_range range(provider, 1);
  vmm::physical_allocation memory(provider, range.size());
  vmm::mapping mapped(memory, range.address(), vmm::access_mode::read_write);
  std::memset(mapped.data(), 7, mapped.size());
  auto [a, b] = vmm::ipc::make_socket_pair();
  // The installed header (generated at build time) and the installed library agree.
  const bool same_version = vmm::version().text == std::string_view(VMM_VERSION_STRING);
  const bool ok =
      static_cast<unsigned char*>(mapped.data())[mapped.size() - 1] == 7 && a && b && same_version;
  std::puts(ok ? "consumer: ok" : "consumer: wrong bytes");
  return ok ? 0 : 1;
}
