// A handler object that exports a function the manifest does not list.
extern "C" __attribute__((section(".spin.payload.raw_payload"))) int raw_payload(void*) { return 0; }
extern "C" int extra_export(int x) { return x + 1; }
