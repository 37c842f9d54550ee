"""The single controller: Worker, WorkerGroup, @register/Dispatch/Execute and the backends.

Knows no RL role or loop. ``hybridflow.single_controller.ray`` is the Ray backend;
``hybridflow.single_controller.inprocess`` runs the same WorkerGroup API inside the driver.
"""
