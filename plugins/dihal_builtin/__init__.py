"""dihal-bench's built-in plugins, registered through the same entry points as third-party ones."""
