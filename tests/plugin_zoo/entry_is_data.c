/* The zoo's plugin whose devalloc_plugin_negotiate is a data object (an ELF
 * symbol of type STT_OBJECT), not a function: dlsym finds it all the same,
 * and a loader that called it would jump into data and crash. Written
 * without the ABI header, whose declaration of the entry point would
 * clash. */
__attribute__((visibility("default"))) const unsigned char devalloc_plugin_negotiate[64] = {0};
