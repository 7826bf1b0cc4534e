"""Starting things: the C dataplane, the duck emulator, a whole emulated cluster, and
finding their programs. ``topology`` reads the cluster's TOML description."""
