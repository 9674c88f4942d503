//! Binding the client port once and sharing it between the shards.
//!
//! One socket is bound without SO_REUSEPORT, so a second process (any user)
//! asking for the same address fails with "address in use" instead of
//! silently taking half the connections; each shard accepts on its own
//! descriptor (a dup) of that one socket.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, OwnedFd};

/// Binds `addr` once and returns `count` descriptors of the listening
/// socket, one per shard.
pub fn bind_shared(addr: SocketAddr, count: usize) -> std::io::Result<Vec<TcpListener>> {
    assert!(count > 0, "at least one shard");
    let first = bind_one(addr)?;
    let mut out: Vec<TcpListener> = Vec::with_capacity(count);
    for _ in 1..count {
        out.push(first.try_clone()?);
    }
    out.push(first);
    Ok(out)
}

fn bind_one(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: socket returned a fresh descriptor nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SO_REUSEADDR only lets a restart bind past TIME_WAIT connections; on
    // Linux it never lets two listeners share a port.
    // SAFETY: valid descriptor, option pointer and length.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (storage, len) = sockaddr(addr);
    // SAFETY: storage holds a valid sockaddr of length len.
    if unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: valid descriptor.
    if unsafe { libc::listen(fd, 1024) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let listener = TcpListener::from(owned);
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe {
                std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin);
            }
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe {
                std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6);
            }
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_share_one_port_and_exclude_others() {
        let ls = bind_shared("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let addr = ls[0].local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        assert!(ls.iter().all(|l| l.local_addr().unwrap() == addr));
        let err = bind_shared(addr, 1).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    }
}
