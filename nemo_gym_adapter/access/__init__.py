"""Only the run's own clients get in: the run's rollout key (:mod:`.key`), the guard every rollout server puts in
front of its routes (:mod:`.guard`), and where the run's processes listen (:mod:`.listen`). docs/CLUSTER.md says which
port is exposed to whom and why."""
