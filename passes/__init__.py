"""Built-in seasonings: graph rewrites, precision passes and build options."""
