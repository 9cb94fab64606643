package podnet

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// BenchmarkE2ESetupAfterReboot sets up 30 pod networks at once, as an
// agent does after a reboot: the addresses are in the store, the network
// namespaces and veths are gone. One op is the 30; between ops each
// pod's veth and namespace are deleted, and the kernel given a second to
// finish tearing them down.
func BenchmarkE2ESetupAfterReboot(b *testing.B) {
	e := newEnv(b, "10.42.0.0/24")
	const pods = 30
	uids := make([]string, pods)
	for i := range uids {
		uids[i] = fmt.Sprintf("%08d-0000-4000-8000-000000000000", i)
	}
	setupAll := func() {
		var wg sync.WaitGroup
		for _, uid := range uids {
			wg.Go(func() {
				if _, err := e.net.Setup(context.Background(), uid); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
	}
	host := handleAt(b, e.host)
	lose := func() {
		for _, uid := range uids {
			if l, err := host.LinkByName(hostVethName(uid)); err == nil {
				host.LinkDel(l)
			}
			if err := removeNetNS(e.net.NetNSPath(uid)); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(time.Second)
	}
	setupAll() // the addresses
	for b.Loop() {
		b.StopTimer()
		lose()
		b.StartTimer()
		setupAll()
	}
}
