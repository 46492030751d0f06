"""Model families: one module per family says where its components live and how to run it."""
