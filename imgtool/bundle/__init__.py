"""Bundles: a directory holding a checksummed, split image archive plus its index (bundle.json).

`writer` makes one from pulled images; `reader` streams and checks its archive; `verify`
checks a bundle; `load` puts it into Docker through a daemon adapter. See docs/bundle-format.md.
"""
