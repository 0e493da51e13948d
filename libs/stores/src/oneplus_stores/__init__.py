"""Domain stores and adapters on the bus: the finished-job archive, the reservation audit, the cluster view."""
