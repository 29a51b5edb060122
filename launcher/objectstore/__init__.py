"""A run's record on object storage (output_dir=s3://..., gs://..., any fsspec URL): launcher.objectstore.runrecord."""
