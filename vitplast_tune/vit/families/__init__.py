"""Model families by adapter: one module per family says where its components live and how to run it
(``base.Family``); ``registry`` picks a model's family by its class."""
