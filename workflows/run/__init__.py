"""Planning a run and running it on a pilot: the spec, the plan, the pilot process, the EnTK pipeline."""
