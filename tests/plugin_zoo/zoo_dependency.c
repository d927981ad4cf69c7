/* The library that libdevalloc_zoo_missing_dep.so needs; it is built where
 * the dynamic linker never looks, so that opening that plugin fails. */
__attribute__((visibility("default"))) int devalloc_zoo_dependency_answer(void) {
  return 42;
}
