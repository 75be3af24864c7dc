"""A booking desk: an agent of another shape than refunds, on loopwright's public API."""
