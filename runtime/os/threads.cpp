#include "runtime/os/threads.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include <pthread.h>

namespace ashlar {

void name_this_thread(const char* name) {
  const std::string kept{name, std::min<size_t>(std::strlen(name), 15)};
  (void) ::pthread_setname_np(::pthread_self(), kept.c_str());
}

}  // namespace ashlar
