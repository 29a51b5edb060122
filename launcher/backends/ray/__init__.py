"""--cluster ray: a job placed on a Ray cluster, one node agent per placement-group bundle (docs/ray.md)."""
