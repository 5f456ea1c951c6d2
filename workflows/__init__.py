"""What runs on the workstation: the CLI, the EnTK pipeline, resources, demo data."""
