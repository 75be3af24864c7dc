"""The desk's own tools package: a name loopwright itself used to install at top level."""
