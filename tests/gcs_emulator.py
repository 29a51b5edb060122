"""`python -m tests.gcs_emulator start ...`: gcp-storage-emulator (tests/object_store_servers.py's GCS) with the JSON
API's objects.move (POST .../o/SOURCE/moveTo/o/DEST), which GCS serves and the emulator answers 501 to.

gcsfs moves an object with moveTo (torch's checkpoint writer renames its .metadata once a save) and takes a 501 for a
passing fault: it retried each move with backoff for ~30 s before it copied and deleted instead, ~60 s of
tests/test_object_store.py's GCS test spent asleep. Here the move is what GCS does: the object under its new name,
the old name gone, in one call.
"""

from __future__ import annotations

import sys
from http import HTTPStatus

from gcp_storage_emulator import server, settings
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


def move(request, response, storage, *args, **kwargs) -> None:
    bucket, source, dest = (request.params[k] for k in ("bucket_name", "object_id", "dest_object_id"))
    try:
        moved = objects._copy(request.base_url, storage, bucket, source, bucket, dest)
        storage.delete_file(bucket, source)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    response.json(moved)


# before the emulator's own routes: its generic object route would take the path, and answer 501 to a POST
server.HANDLERS = (*((rf"^{api}/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/(?P<dest_object_id>.*[^/]+)$",
                      {server.POST: move}) for api in (settings.API_ENDPOINT, "")), *server.HANDLERS)

if __name__ == "__main__":
    main(sys.argv[1:])
