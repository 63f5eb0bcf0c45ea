"""The HTTP routes, one `APIRouter` module per resource. A module's ``router`` holds its open routes and its
``keyed`` router the routes that need the API key when the service has one (`service.app` adds the check): the
writes, /admin and the reads of a user's stored history."""
