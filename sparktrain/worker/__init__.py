"""Code that runs inside each rank's training process (never imports pyspark)."""
