/*
 * The plugin zoo: plugins that are broken in one way each, for the loader's
 * tests. Built once per variant with one compile definition:
 *   DEVALLOC_ZOO_NO_ENTRY     exports a function, but not the entry point
 *   DEVALLOC_ZOO_REFUSES      the entry point fails with INTERNAL
 *   DEVALLOC_ZOO_MAJOR2       speaks ABI major 2 only and says so
 *   DEVALLOC_ZOO_LIES_MAJOR2  answers OK with major 2 to a host asking for 1
 *   DEVALLOC_ZOO_SMALL_TABLE  answers OK with a 16-byte function table
 *   DEVALLOC_ZOO_CREATE_FAILS create() finds no vendor runtime
 *   DEVALLOC_ZOO_MISSING_DEP  needs a library the dynamic linker cannot find
 * Every function of a table other than create() answers UNSUPPORTED: the
 * loader must refuse these plugins before it calls any of them.
 */
#include <devalloc/plugin_abi.h>

#include <stdio.h>

#if defined(DEVALLOC_ZOO_NO_ENTRY)

__attribute__((visibility("default"))) int devalloc_zoo_not_the_entry_point(void) {
  return 0;
}

#else

static devalloc_status zoo_fail(devalloc_error* error, devalloc_status status,
                                const char* message) {
  if (error != NULL &&
      error->struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_error, message)) {
    snprintf(error->message, sizeof error->message, "%s", message);
  }
  return status;
}

#if defined(DEVALLOC_ZOO_MISSING_DEP)
/* Defined in libdevalloc_zoo_dependency.so; calling it keeps that library in
 * DT_NEEDED even when the linker drops unused ones. */
int devalloc_zoo_dependency_answer(void);
#endif

static devalloc_status zoo_create(devalloc_create_args* args, devalloc_error* error) {
  (void)args;
#if defined(DEVALLOC_ZOO_CREATE_FAILS)
  return zoo_fail(error, DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                  "zoo: vendor runtime libzoo.so.3 not found");
#elif defined(DEVALLOC_ZOO_MISSING_DEP)
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED,
                  devalloc_zoo_dependency_answer() == 42 ? "zoo: unsupported"
                                                         : "zoo: broken dependency");
#else
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
#endif
}

static void zoo_destroy(devalloc_instance* instance) { (void)instance; }

static devalloc_status zoo_get_capabilities(devalloc_instance* instance,
                                            devalloc_capabilities* capabilities,
                                            devalloc_error* error) {
  (void)instance;
  (void)capabilities;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_get_device_count(devalloc_instance* instance, uint32_t* count,
                                            devalloc_error* error) {
  (void)instance;
  (void)count;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_get_device_properties(devalloc_instance* instance,
                                                 uint32_t device,
                                                 devalloc_device_properties* properties,
                                                 devalloc_error* error) {
  (void)instance;
  (void)device;
  (void)properties;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_allocate(devalloc_instance* instance, devalloc_allocate_args* args,
                                    devalloc_error* error) {
  (void)instance;
  (void)args;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_deallocate(devalloc_instance* instance, uint32_t device,
                                      devalloc_device_address address, devalloc_error* error) {
  (void)instance;
  (void)device;
  (void)address;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_copy_host_to_device(devalloc_instance* instance,
                                               const devalloc_copy_to_device_args* args,
                                               devalloc_error* error) {
  (void)instance;
  (void)args;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_copy_device_to_host(devalloc_instance* instance,
                                               const devalloc_copy_to_host_args* args,
                                               devalloc_error* error) {
  (void)instance;
  (void)args;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

static devalloc_status zoo_synchronize(devalloc_instance* instance, uint32_t device,
                                       devalloc_error* error) {
  (void)instance;
  (void)device;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: unsupported");
}

/* Not static: the variants that refuse to negotiate never hand it out, and
 * hidden visibility keeps it unexported all the same. */
const devalloc_plugin_api_v1 devalloc_zoo_api = {
#if defined(DEVALLOC_ZOO_SMALL_TABLE)
    16,
#else
    sizeof(devalloc_plugin_api_v1),
#endif
    DEVALLOC_ABI_VERSION_MAJOR,
    DEVALLOC_ABI_VERSION_MINOR,
    "zoo",
    "0",
    zoo_create,
    zoo_destroy,
    zoo_get_capabilities,
    zoo_get_device_count,
    zoo_get_device_properties,
    zoo_allocate,
    zoo_deallocate,
    zoo_copy_host_to_device,
    zoo_copy_device_to_host,
    zoo_synchronize,
    NULL,
    NULL,
};

devalloc_status devalloc_plugin_negotiate(devalloc_negotiation* negotiation,
                                          devalloc_error* error) {
  if (negotiation == NULL ||
      negotiation->struct_size < DEVALLOC_STRUCT_SIZE(devalloc_negotiation, api)) {
    return zoo_fail(error, DEVALLOC_STATUS_INVALID_ARGUMENT,
                    "zoo: negotiation struct is NULL or too small");
  }
  negotiation->plugin_major = DEVALLOC_ABI_VERSION_MAJOR;
  negotiation->plugin_minor = DEVALLOC_ABI_VERSION_MINOR;
  negotiation->plugin_min_major = DEVALLOC_ABI_VERSION_MAJOR;
  negotiation->api = NULL;
#if defined(DEVALLOC_ZOO_REFUSES)
  return zoo_fail(error, DEVALLOC_STATUS_INTERNAL, "zoo: refusing to negotiate");
#elif defined(DEVALLOC_ZOO_MAJOR2)
  negotiation->plugin_major = 2;
  negotiation->plugin_minor = 0;
  negotiation->plugin_min_major = 2;
  return zoo_fail(error, DEVALLOC_STATUS_UNSUPPORTED, "zoo: speaks ABI major 2 only");
#elif defined(DEVALLOC_ZOO_LIES_MAJOR2)
  negotiation->plugin_major = 2;
  negotiation->plugin_minor = 0;
  negotiation->plugin_min_major = 2;
  negotiation->api = &devalloc_zoo_api;
  return DEVALLOC_STATUS_OK;
#else
  negotiation->api = &devalloc_zoo_api;
  return DEVALLOC_STATUS_OK;
#endif
}

#endif
