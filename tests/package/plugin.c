/* An application's own shared library that links the static libiha.a: this links only when
 * libiha.a is position-independent. */
#include <iha.h>

unsigned plugin_iha_version(void) { return iha_version_number(); }
