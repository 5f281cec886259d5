"""The all-reduce family of cluster step engines: replicas that live on their workers, gradients reduced worker to
worker (the built-in all-reduce, backup replicas, strategy functions) and the collective they share."""
