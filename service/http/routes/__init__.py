"""The HTTP routes, one `APIRouter` module per resource. A module's ``router`` holds its open routes and its
``keyed`` router the routes that need the API key when the service has one (`service.http.app` adds the check): the
writes, /admin and the reads of a user's stored history. POST /recommend needs the key for a body with a user_id
only, so its route checks it (`service.http.deps.check_key`) and `recommend.guarded` documents it."""
