"""The suite's fork server for launches whose subject is not the launch (``tests/forked_launch.py``): a process that has
imported the trainer once forks each launch from itself, so a launch costs neither an interpreter's start nor the
trainer's import (~3.5 s of CPU on 2 cores, some twenty times a suite). ``tests/forked_launch.py`` asks it over the
Unix socket that LAUNCH_SERVER names (tests/conftest.py starts one for each pytest process), handing over its standard
streams, working folder, environment and arguments; the launch's exit status comes back. A launch runs in a process
group of its own: when its client goes away (a test's timeout, a kill), the group is killed.

    python tests/launch_server.py SOCKET     (ends when its standard input closes: the pytest process is gone)

Forking from here is as safe as forked_launch's own fork of its ranks: this process starts no thread and no process
group. Python's standard library had nothing of this shape (multiprocessing's forkserver starts functions, not a
command's launch with the caller's streams)."""
import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
import traceback

REQUEST_FDS = 3  # the client's stdin, stdout and stderr
OWN_SHM = 'LAUNCH_OWN_SHM'  # =1 in a launch's environment: it runs as a node of its own (``own_dev_shm``)
CLONE_NEWNS, CLONE_NEWUSER, MS_REC, MS_PRIVATE = 0x20000, 0x10000000, 0x4000, 0x40000  # <sched.h>, <sys/mount.h>


def receive_request(connection: socket.socket) -> tuple[dict, list[int]]:
    """The client's streams (sent with one byte), then its request: 4 bytes of length and that much JSON."""
    _, fds, _, _ = socket.recv_fds(connection, 1, REQUEST_FDS)
    size = struct.unpack('!I', receive_exactly(connection, 4))[0]
    return json.loads(receive_exactly(connection, size)), fds


def receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b''
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError('the client went away mid-request')
        data += chunk
    return data


def send_request(connection: socket.socket, request: dict) -> None:
    """What ``receive_request`` reads: this process's standard streams, then the request."""
    socket.send_fds(connection, [b'L'], [0, 1, 2])
    payload = json.dumps(request).encode()
    connection.sendall(struct.pack('!I', len(payload)) + payload)


def run_launch(request: dict, fds: list[int]) -> int:
    """In the forked child: become the client's process (its streams, folder, environment, arguments) and launch."""
    from tests.forked_launch import main
    os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    if os.environ.get(OWN_SHM) == '1':
        own_dev_shm()
    sys.path[:0] = [path for path in request['env'].get('PYTHONPATH', '').split(os.pathsep) if path]
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return main(request['argv'])


def own_dev_shm() -> None:
    """This process and those it starts in a user and mount namespace of their own with an empty /dev/shm, as a node
    of its own has (``unshare --user --map-root-user --mount`` and ``mount -t tmpfs tmpfs /dev/shm``): streaming
    keeps one set of shared memory a node there, so nodes simulated on one machine need one each (the Slurm test)."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    steps = [lambda: libc.unshare(CLONE_NEWUSER | CLONE_NEWNS),
             lambda: write('/proc/self/setgroups', 'deny'), lambda: write('/proc/self/uid_map', f'0 {uid} 1'),
             lambda: write('/proc/self/gid_map', f'0 {gid} 1'),
             lambda: libc.mount(b'none', b'/', None, MS_REC | MS_PRIVATE, None),
             lambda: libc.mount(b'tmpfs', b'/dev/shm', b'tmpfs', 0, None)]
    for step in steps:
        if step():
            raise OSError(ctypes.get_errno(), 'a node of its own: unshare or mount failed')


def write(path: str, text: str) -> int:
    with open(path, 'w') as file:
        file.write(text)
    return 0


def fork_launch(connection: socket.socket, others: list[socket.socket]) -> int:
    """The pid of a child running the request that arrives on ``connection`` (``others``: this server's sockets,
    which the child closes)."""
    request, fds = receive_request(connection)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for other in (connection, *others):
                other.close()
            code = run_launch(request, fds)
        except BaseException:  # the client sees it on its stderr, and the exit status
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    for fd in fds:
        os.close(fd)
    return pid


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + '.unready')
    listener.listen(16)  # clients connecting before the import below wait in the backlog
    os.rename(path + '.unready', path)  # the path appears listening: the suite waits for it
    import llmfoundry_ext.train  # noqa: F401  what every launch's ranks import
    import tests.training_runs_worker  # noqa: F401
    gc.freeze()  # the imported objects: no launch's collections walk them (and copy their pages)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    launches: dict[socket.socket, int] = {}
    while True:
        for key, _ in selector.select(timeout=0.05):
            if key.fileobj is sys.stdin:  # the pytest process is gone: so are its launches
                for pid in launches.values():
                    kill_group(pid)
                return
            if key.fileobj is listener:
                connection, _ = listener.accept()
                launches[connection] = fork_launch(connection, [listener, *launches])
                selector.register(connection, selectors.EVENT_READ)
            else:  # the client closed its end before its launch ended
                kill_group(launches[key.fileobj])
                selector.unregister(key.fileobj)
        for connection, pid in list(launches.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                try:
                    connection.sendall(struct.pack('!i', os.waitstatus_to_exitcode(status)))
                    selector.unregister(connection)
                except (OSError, KeyError):
                    pass  # its client is gone
                connection.close()
                del launches[connection]


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == '__main__':
    sys.path[0] = os.path.dirname(sys.path[0])  # the repository, for tests.forked_launch and its scripts
    serve(sys.argv[1])
