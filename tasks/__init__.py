"""What runs inside the pilot: split, analyze and reduce, their readers and kernels.

Nothing here imports trajflow.workflows: a task needs only its plan.json.
"""
