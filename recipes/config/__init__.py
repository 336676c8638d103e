"""The torch-free configuration machinery: schema, overrides, config files, validation,
path checks, the layout object and the machine check."""
