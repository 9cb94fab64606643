// Command echo is a test helper for the service proxy's end-to-end tests,
// for what busybox cannot do: a UDP server, and clients that say whether a
// connection was refused or timed out.
//
//	echo udp-serve ADDR NAME    answer every datagram with "NAME CLIENT-IP"
//	echo udp ADDR               send one datagram, print the answer
//	echo get URL                HTTP GET, print the body
//
// The clients exit 1 on a timeout, 2 on a refusal, 3 on any other error.
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: echo udp-serve ADDR NAME | udp ADDR | get URL")
		os.Exit(3)
	}
	switch os.Args[1] {
	case "udp-serve":
		if len(os.Args) < 4 {
			fail(errors.New("udp-serve: want ADDR NAME"))
		}
		fail(serveUDP(os.Args[2], os.Args[3]))
	case "udp":
		fail(askUDP(os.Args[2]))
	case "get":
		fail(get(os.Args[2]))
	default:
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

func serveUDP(addr, name string) error {
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		_, from, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		ip := from.(*net.UDPAddr).IP
		c.WriteTo([]byte(fmt.Sprintf("%s %s\n", name, ip)), from)
	}
}

func askUDP(addr string) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 1500)
	// A lost datagram is retried, as a resolver would.
	for range 3 {
		if _, err := c.Write([]byte("hi")); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if err == nil {
			os.Stdout.Write(buf[:n])
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
	}
	return os.ErrDeadlineExceeded
}

func get(url string) error {
	cl := http.Client{Timeout: 3 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(os.Stdout, resp.Body)
	return err
}

func fail(err error) {
	if err == nil {
		os.Exit(0)
	}
	fmt.Fprintln(os.Stderr, "echo:", err)
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		os.Exit(2)
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		os.Exit(1)
	}
	os.Exit(3)
}
