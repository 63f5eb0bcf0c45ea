"""The HTTP routes, one `APIRouter` module per resource. A module's ``router`` holds its open routes and its
``writes`` router the routes that need the API key when the service has one (`service.app` adds the check)."""
