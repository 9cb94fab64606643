package bridge

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// portSet listens on many ports, one per node, with one goroutine for
// all of them: an epoll set of listening sockets, whose connections come
// out of one net.Listener (Accept). A net.Listener per port would cost a
// goroutine blocked in Accept for every node, 8 KiB or so of stack each:
// 16 MiB at 2,000 nodes, for ports that are mostly idle.
type portSet struct {
	host  net.IP
	epfd  int
	stop  int // an eventfd that ends the poller
	conns chan net.Conn
	quit  chan struct{} // closed by Close
	done  chan struct{} // closed when the poller ended

	mu     sync.Mutex
	fds    map[int]int // port → listening socket
	closed bool
}

// newPortSet returns a set for ports on host and starts its poller.
func newPortSet(host net.IP) (*portSet, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, stop, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(stop)}); err != nil {
		unix.Close(epfd)
		unix.Close(stop)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	p := &portSet{host: host, epfd: epfd, stop: stop, conns: make(chan net.Conn), quit: make(chan struct{}), done: make(chan struct{}), fds: map[int]int{}}
	go p.poll()
	return p, nil
}

// add listens on port; an error is the port's (in use, most likely).
func (p *portSet) add(port int) error {
	family, sa := unix.AF_INET, unix.Sockaddr(nil)
	if ip4 := p.host.To4(); ip4 != nil {
		a := &unix.SockaddrInet4{Port: port}
		copy(a.Addr[:], ip4)
		sa = a
	} else {
		a := &unix.SockaddrInet6{Port: port}
		copy(a.Addr[:], p.host.To16())
		family, sa = unix.AF_INET6, a
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	fail := func(what string, err error) error {
		unix.Close(fd)
		return fmt.Errorf("%s %s: %w", what, net.JoinHostPort(p.host.String(), fmt.Sprint(port)), err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fail("listen", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("listen", err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		return fail("listen", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		unix.Close(fd)
		return net.ErrClosed
	}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
		return fail("epoll", err)
	}
	p.fds[port] = fd
	return nil
}

// remove stops listening on port; connections accepted before go on.
func (p *portSet) remove(port int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if fd, ok := p.fds[port]; ok {
		unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil)
		unix.Close(fd)
		delete(p.fds, port)
	}
}

// poll accepts what every listening socket has, until Close.
func (p *portSet) poll() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		for _, ev := range events[:n] {
			if int(ev.Fd) == p.stop {
				return
			}
			p.acceptAll(int(ev.Fd))
		}
	}
}

// acceptAll accepts every connection waiting on fd and hands each to
// Accept.
func (p *portSet) acceptAll(fd int) {
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		nfd, _, err := unix.Accept4(fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			// EAGAIN: no more; anything else (a socket removed
			// meanwhile, a connection reset before it was taken, out
			// of descriptors) drops this one, as a listener would.
			return
		}
		f := os.NewFile(uintptr(nfd), "kubelet-api")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			continue
		}
		select {
		case p.conns <- c:
		case <-p.quit:
			c.Close()
			return
		}
	}
}

// Accept returns the next connection to any port of the set.
func (p *portSet) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.quit:
		return nil, net.ErrClosed
	}
}

// Close stops listening on every port and ends the poller.
func (p *portSet) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.quit)
	for port, fd := range p.fds {
		unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil)
		unix.Close(fd)
		delete(p.fds, port)
	}
	p.mu.Unlock()
	var one [8]byte
	one[0] = 1
	unix.Write(p.stop, one[:])
	<-p.done
	unix.Close(p.stop)
	unix.Close(p.epfd)
	return nil
}

// Addr is the host's, without a port: the set has many.
func (p *portSet) Addr() net.Addr { return &net.TCPAddr{IP: p.host} }
