"""The console websockets: ``/ws/console/<vm>/vnc/?ticket=…`` bridges binary frames to the VM's
VNC display (noVNC speaks RFB end to end; this is a byte pipe), ``/ws/console/<vm>/serial/?ticket=…``
bridges text frames to its serial console (UTF-8 both ways).

Each socket spends a one-time ticket (``console.services.redeem``) issued to the signed-in user
of the socket's session. A refused socket is accepted, sent the reason as a text frame
``\r\n[console refused: <reason>]\r\n`` and closed with 4403 (a refused handshake looks to a
browser like a network error and tells it nothing); a console the host cannot give is 4404.
"""

import asyncio
import codecs
import logging
import threading
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from console import services
from core import metrics
from drivers.base import DriverError

log = logging.getLogger(__name__)

CLOSE_REFUSED = 4403
CLOSE_NO_CONSOLE = 4404
CHUNK = 1 << 16
REFUSED_PREFIX = "\r\n[console refused: "


class _ConsoleConsumer(AsyncWebsocketConsumer):
    kind = ""
    # No channel layer: nothing is sent to a console socket from elsewhere, and a socket bound
    # to the Redis layer dies with it when Redis is slow to answer.
    channel_layer_alias = None

    async def connect(self):
        self.session_id = None
        vm_id = int(self.scope["url_route"]["kwargs"]["vm_id"])
        query = parse_qs(self.scope.get("query_string", b"").decode())
        ticket = (query.get("ticket") or [""])[0]
        try:
            redeem = database_sync_to_async(services.redeem)
            session, vm = await redeem(ticket, self.scope.get("user"), vm_id, self.kind)
        except services.Refused as exc:
            await self._refuse(CLOSE_REFUSED, str(exc))
            return
        self.session_id = session.pk
        try:
            await self.open_backend(vm)
        except (DriverError, OSError) as exc:
            log.warning("%s console of VM %s: %s", self.kind, vm_id, exc)
            await self._refuse(CLOSE_NO_CONSOLE, services.console_error(exc))
            return
        subprotocols = self.scope.get("subprotocols") or []
        await self.accept("binary" if "binary" in subprotocols else None)
        self.counted = True
        metrics.WS_CLIENTS.inc()
        self.pump = asyncio.get_running_loop().create_task(self._pump())
        self.heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _refuse(self, code, reason):
        # Daphne sends no close reason, so the reason goes first as a text frame (the serial
        # view shows it; noVNC ignores text, and its page learnt the reason from the ticket).
        await self.accept()
        await self.send(text_data=f"{REFUSED_PREFIX}{reason}]\r\n")
        await self.close(code=code)

    async def disconnect(self, code):
        if getattr(self, "counted", False):
            self.counted = False
            metrics.WS_CLIENTS.dec()
        if hasattr(self, "pump"):
            self.pump.cancel()
        if hasattr(self, "heartbeat"):
            self.heartbeat.cancel()
        await self.close_backend()
        if self.session_id is not None:
            await database_sync_to_async(services.closed)(self.session_id)
            self.session_id = None

    async def _beat(self):
        while True:
            await database_sync_to_async(services.still_open)(self.session_id)
            await asyncio.sleep(settings.CONSOLE_HEARTBEAT_SECONDS)

    async def _pump(self):
        try:
            await self.pump_backend()
        except (OSError, DriverError) as exc:
            log.info("%s console ended: %s", self.kind, exc)
        await self.close()

    async def open_backend(self, vm):
        raise NotImplementedError

    async def pump_backend(self):
        raise NotImplementedError

    async def close_backend(self):
        raise NotImplementedError


class VNCConsumer(_ConsoleConsumer):
    """Browser (noVNC) ⇄ the VM's VNC server over TCP."""

    kind = "vnc"
    writer = None

    async def open_backend(self, vm):
        host, port = await database_sync_to_async(services.vnc_address)(vm)
        self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=10)

    async def pump_backend(self):
        while data := await self.reader.read(CHUNK):
            await self.send(bytes_data=data)

    async def receive(self, text_data=None, bytes_data=None):
        if bytes_data and self.writer is not None:
            self.writer.write(bytes_data)
            await self.writer.drain()

    async def close_backend(self):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class SerialConsumer(_ConsoleConsumer):
    """Browser text ⇄ the VM's serial console stream (read by a thread of its own: the
    driver's read blocks, and would hold a shared executor thread for the whole session)."""

    kind = "serial"
    stream = None

    async def open_backend(self, vm):
        self.stream = await database_sync_to_async(services.serial_stream)(vm)
        self.arrived = asyncio.Queue()
        loop = asyncio.get_running_loop()
        stream = self.stream

        def read():
            while data := stream.read():
                loop.call_soon_threadsafe(self.arrived.put_nowait, data)
            loop.call_soon_threadsafe(self.arrived.put_nowait, b"")

        threading.Thread(target=read, name=f"serial-console-{vm.pk}", daemon=True).start()

    async def pump_backend(self):
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while data := await self.arrived.get():
            text = decoder.decode(data)
            if text:
                await self.send(text_data=text)

    async def receive(self, text_data=None, bytes_data=None):
        data = text_data.encode() if text_data is not None else bytes_data
        if data and self.stream is not None:
            await asyncio.to_thread(self.stream.write, data[:CHUNK])

    async def close_backend(self):
        if self.stream is not None:
            stream, self.stream = self.stream, None
            await asyncio.to_thread(stream.close)
