"""Reading a database: open it, the pure epoch plan, byte sources (buffered, direct I/O), the range reader."""
