// A handler object with a constructor: code that would run when the object is loaded.
extern "C" __attribute__((section(".spin.payload.raw_payload"))) int raw_payload(void*) { return 0; }
static volatile int touched;
__attribute__((constructor, used)) static void at_load() { touched = 1; }
