"""Join runs by UUID, compare them one limit at a time, say which limit bound each, write the report."""
