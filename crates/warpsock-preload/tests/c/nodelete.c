// Loads the library named by argv[1] with dlopen, closes it, and asks
// whether it is still loaded (RTLD_NOLOAD): a library whose code a
// thread-specific key's destructor runs at every thread's exit must never
// be unmapped (linked -z nodelete). Exit 0: still loaded; 1: unloaded.
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s LIBRARY\n", argv[0]);
    return 2;
  }
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  if (dlclose(h) != 0) {
    fprintf(stderr, "dlclose: %s\n", dlerror());
    return 2;
  }
  void *again = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
  puts(again ? "kept" : "unloaded");
  return again ? 0 : 1;
}
