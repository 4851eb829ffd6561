"""Writing a database: scan sources, prepare images, the resumable writer, verify."""
