// Names for the threads Ashlar starts itself, so that `top -H`, `ps -L`, perf and gdb
// tell them apart (threads otherwise take the name of the thread that started them,
// often CAF's "caf.multiplexer").
#pragma once

namespace ashlar {

/// Names the calling thread `name` (at most 15 characters are kept, the kernel's limit).
void name_this_thread(const char* name);

}  // namespace ashlar
