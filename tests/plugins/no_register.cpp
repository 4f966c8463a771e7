// A shared library that is not a divlab plug-in: it exports no divlab_plugin_register.
extern "C" int not_a_plugin(void) {
  return 42;
}
