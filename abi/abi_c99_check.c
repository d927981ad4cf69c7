/* Compiled as C99 -pedantic -Werror: the ABI header must stand alone. */
#include <devalloc/plugin_abi.h>

typedef char devalloc_error_is_first_field_sized
    [(offsetof(devalloc_error, struct_size) == 0) ? 1 : -1];
