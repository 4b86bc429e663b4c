// Links vmm::store from the installed package: a name the store's protocol accepts, one it
// refuses, and a status's name.
#include <cstdio>
#include <cstring>
#include <string>

#include <vmm/store/protocol.hpp>

int main() {
  std::string why;
  if (!vmm::store::valid_name("weights/layer0") || vmm::store::valid_name("", &why) || why.empty()) {
    std::puts("store_consumer: the store's names are not checked as documented");
    return 1;
  }
  std::printf("store_consumer: vmm::store linked (%s)\n", vmm::store::to_string(vmm::store::status::ok));
  return 0;
}
