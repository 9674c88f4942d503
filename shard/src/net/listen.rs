//! Binding one listening socket per shard on the same address.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, OwnedFd};

/// Binds `count` listeners on `addr` with SO_REUSEPORT, so the kernel spreads
/// incoming connections across shards. With port 0 the first bind picks the
/// port and the others join it.
pub fn bind_reuseport(addr: SocketAddr, count: usize) -> std::io::Result<Vec<TcpListener>> {
    let mut out: Vec<TcpListener> = Vec::with_capacity(count);
    let mut addr = addr;
    for _ in 0..count {
        let l = bind_one(addr)?;
        addr = l.local_addr()?;
        out.push(l);
    }
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
    for opt in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
        // SAFETY: valid descriptor, option pointer and length.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
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
    fn listeners_share_one_port() {
        let ls = bind_reuseport("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let port = ls[0].local_addr().unwrap().port();
        assert_ne!(port, 0);
        assert!(ls.iter().all(|l| l.local_addr().unwrap().port() == port));
    }
}
