// A handler object that calls libc, which dlopen would bind to the process's copy.
extern "C" int puts(const char*);
extern "C" __attribute__((section(".spin.payload.raw_payload"))) int raw_payload(void*) { return puts("libc reached from a handler"); }
