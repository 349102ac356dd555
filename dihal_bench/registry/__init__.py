"""The plugin registry: the pluggy hookspecs, the manager that loads built-in and installed
plugins, and name resolution (a name in a suite -> a built backbone, corpus or bridge)."""
