"""Images and audio that requests carry: decoded from base64 or data URLs, or fetched from hosts the operator allowed."""
