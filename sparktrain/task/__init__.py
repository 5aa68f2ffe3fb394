"""Code that runs inside a Spark barrier task, or in the local supervisor on the driver."""
