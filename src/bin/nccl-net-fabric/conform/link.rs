//! The two sides of `conform` talk over one plain TCP connection, as NCCL's bootstrap does:
//! lines of space-separated words, each read with a deadline. It carries NCCL's handles and
//! the steps of each check, never data of the plugin's.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

pub struct Link {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Link {
    fn new(stream: TcpStream) -> Result<Link, String> {
        stream.set_nodelay(true).ok();
        let writer = stream.try_clone().map_err(|e| format!("the link: {e}"))?;
        Ok(Link {
            reader: BufReader::new(stream),
            writer,
        })
    }

    /// Connects to `addr` (`host:port`), retrying until `deadline` (the other side may
    /// still be starting).
    pub fn connect(addr: &str, deadline: Instant) -> Result<Link, String> {
        let target = addr
            .to_socket_addrs()
            .map_err(|e| format!("{addr}: {e}"))?
            .next()
            .ok_or_else(|| format!("{addr}: no address"))?;
        loop {
            match TcpStream::connect_timeout(&target, Duration::from_secs(2)) {
                Ok(s) => return Link::new(s),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("could not reach the other side at {addr}: {e}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Takes the first connection to `listener` before `deadline`.
    pub fn accept(listener: &TcpListener, deadline: Instant) -> Result<Link, String> {
        listener.set_nonblocking(true).ok();
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).ok();
                    return Link::new(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err("the other side never connected".into());
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(format!("accepting the other side: {e}")),
            }
        }
    }

    pub fn send(&mut self, words: &[&str]) -> Result<(), String> {
        let mut line = words.join(" ");
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| format!("the other side is gone ({e})"))
    }

    /// The next line's words, read before `deadline`.
    pub fn recv(&mut self, deadline: Instant) -> Result<Vec<String>, String> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the other side did not answer in time".into());
        }
        self.reader.get_ref().set_read_timeout(Some(left)).ok();
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err("the other side is gone (its end of the link closed)".into()),
            Ok(_) => Ok(line.split_whitespace().map(String::from).collect()),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                Err("the other side did not answer in time".into())
            }
            Err(e) => Err(format!("the other side is gone ({e})")),
        }
    }

    /// The next line, which must start with `word`; its other words.
    pub fn expect(&mut self, word: &str, deadline: Instant) -> Result<Vec<String>, String> {
        let mut got = self.recv(deadline)?;
        if got.first().map(String::as_str) != Some(word) {
            return Err(format!(
                "the other side said {:?}, expected {word}",
                got.join(" ")
            ));
        }
        got.remove(0);
        Ok(got)
    }
}
