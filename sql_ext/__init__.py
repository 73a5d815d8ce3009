"""Spark SQL extension: async lookup joins configured by spark.sql.exec.async-lookup.*."""
