"""Routes: route text, the route composer and its spaces, and restricted spaces."""
