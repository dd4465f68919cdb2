"""What more than one test tier shares: throw-away engines, real servers, other local users."""
