//! [`Smol`]: async-io's sockets and timer as the shared node's runtime.

use std::future::Future;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use cohort_driver_core::node::Runtime;
use smol::{Async, Timer};

/// smol's runtime for `cohort_driver_core::node::Node`: async-io sockets
/// (readiness reported once per reactor event), async-io timers, smol's
/// global executor.
#[derive(Debug, Clone, Copy)]
pub struct Smol;

impl Runtime for Smol {
    type Stream = Async<TcpStream>;
    type Listener = Async<TcpListener>;
    type Timer = Timer;

    fn listener(listener: TcpListener) -> io::Result<Async<TcpListener>> {
        Async::new(listener)
    }

    fn poll_accept(
        listener: &Async<TcpListener>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Async<TcpStream>, SocketAddr)>> {
        loop {
            match listener.get_ref().accept() {
                Ok((sock, addr)) => return Poll::Ready(Async::new(sock).map(|s| (s, addr))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => match listener.poll_readable(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                },
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    async fn resolve(addr: String) -> io::Result<Vec<SocketAddr>> {
        smol::net::resolve(addr.as_str()).await
    }

    fn connect(addr: SocketAddr) -> impl Future<Output = io::Result<Async<TcpStream>>> + Send + 'static {
        Async::<TcpStream>::connect(addr)
    }

    fn poll_read_ready(stream: &Async<TcpStream>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        stream.poll_readable(cx)
    }

    fn poll_write_ready(stream: &Async<TcpStream>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        stream.poll_writable(cx)
    }

    fn try_read(stream: &Async<TcpStream>, buf: &mut [u8]) -> io::Result<usize> {
        stream.get_ref().read(buf)
    }

    fn try_write(stream: &Async<TcpStream>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        stream.get_ref().write_vectored(bufs)
    }

    fn shutdown_write(stream: &mut Async<TcpStream>) -> io::Result<()> {
        stream.get_ref().shutdown(Shutdown::Write)
    }

    fn set_nodelay(stream: &Async<TcpStream>) -> io::Result<()> {
        stream.get_ref().set_nodelay(true)
    }

    fn timer() -> Timer {
        Timer::never()
    }

    fn set_timer(timer: &mut Timer, at: Instant) {
        timer.set_at(at);
    }

    fn poll_timer(timer: &mut Timer, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(timer).poll(cx).map(|_| ())
    }

    fn spawn(task: impl Future<Output = ()> + Send + 'static) {
        smol::spawn(task).detach();
    }
}
