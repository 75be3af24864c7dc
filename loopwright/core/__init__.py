"""The bottom layer: what every other layer speaks in, importing nothing of loopwright's above it.

* `state`: the run's state (S = H, E, J, P, B, V), its models and enums; `views`, `budget`,
  `protocol`, `plan`, `progress`, `compaction`: what reads it (projections, usage and limits,
  the tool envelope, plans, progress signatures, history compaction).
* `roles`: who may do what; `text`: text a store keeps as given.
* `crashpoints`: the named crash windows a test arms; `bounded`: calls that end by the clock;
  `tls`: which certificates outbound HTTPS trusts; `home`: where loopwright keeps local files.
"""
