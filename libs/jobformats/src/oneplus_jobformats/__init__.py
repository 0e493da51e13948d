"""Every input format (Kubeflow, sbatch, CloudEvents, MLflow webhooks) translated into the one JobSpec."""
