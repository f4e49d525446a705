// Command clientv3load drives an etcd v3 server the way real etcd clients do, with etcd's own
// Go client (clientv3 3.4 from Debian's golang-etcd-server-dev, built in GOPATH mode), and
// prints one JSON object of counts. It is the load suite behind scripts/load and the CI test
// crates/baton/tests/client_load.rs; it runs against Baton and etcd alike, so etcd is the
// control.
//
//	clientv3load leases  -endpoints 127.0.0.1:2379 -n 10000 -ttl 10 -hold 30s -sample 20
//	clientv3load watches -endpoints 127.0.0.1:2379 -n 10000
//	clientv3load conns   -endpoints 127.0.0.1:2379 -n 5000 -hold 5s
//	clientv3load lockgap -endpoints a,b,c -pids 11,12,13 -clients 5 -ttl 3 -fault stop -rounds 3
//
// leases: grants n leases and keeps every one alive through one client (clientv3 sends
// every keep-alive on one LeaseKeepAlive stream: a burst of tiny messages every 500 ms),
// for -hold; counts keep-alive channels that closed (the client's word that a lease
// expired) and, of -sample leases spread over the set, how many the server still has.
//
// watches: opens one Watch stream and sends n WatchCreateRequests back to back without
// waiting for answers (as pipelining clients such as grpcio's do; clientv3 itself waits
// for each "created"), then counts the created answers.
//
// conns: opens n separate gRPC connections, each doing one Range, holds them for -hold,
// and checks that a fresh connection is still served while they are open.
//
// lockgap: -clients processes' worth of clients (one clientv3 client and session each, TTL
// -ttl) take turns on one concurrency.Mutex, holding it briefly; meanwhile the program finds
// the leader of a 3-member cluster (-pids: the member processes, in -endpoints order) and
// SIGSTOPs it for -pause (or SIGKILLs it: -fault kill, then the caller restarts it), -rounds
// times. It reports, per round, the longest time nobody held the lock: from the moment a
// holder starts to release (or its session dies) to the moment the next holder's Lock returns.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
	pb "go.etcd.io/etcd/etcdserver/etcdserverpb"
	"google.golang.org/grpc"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: clientv3load leases|watches|conns [flags]")
		os.Exit(2)
	}
	raiseFileLimit()
	var report map[string]interface{}
	var err error
	switch os.Args[1] {
	case "leases":
		report, err = leases(os.Args[2:])
	case "watches":
		report, err = watches(os.Args[2:])
	case "conns":
		report, err = conns(os.Args[2:])
	case "lockgap":
		report, err = lockgap(os.Args[2:])
	default:
		err = fmt.Errorf("unknown workload %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "clientv3load:", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(report)
	fmt.Println(string(out))
}

// raiseFileLimit lifts the soft descriptor limit to the hard one: `conns` holds thousands.
func raiseFileLimit() {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}

// cpuSeconds is the user + system CPU a process has used (0 for pid 0 or an unreadable one).
func cpuSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	var utime, stime float64
	fmt.Sscan(fields[11], &utime)
	fmt.Sscan(fields[12], &stime)
	return (utime + stime) / 100 // USER_HZ is 100 on Linux
}

// parallelFor runs work(i) for every i in [0, n) on `workers` goroutines and waits for all.
func parallelFor(n, workers int, work func(i int)) {
	var next int64 = -1
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := atomic.AddInt64(&next, 1)
				if i >= int64(n) {
					return
				}
				work(int(i))
			}
		}()
	}
	wg.Wait()
}

func newClient(endpoints string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(endpoints, ","),
		DialTimeout: 5 * time.Second,
	})
}

func progress(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000")+" "+format+"\n", args...)
}

func leases(args []string) (map[string]interface{}, error) {
	fs := flag.NewFlagSet("leases", flag.ExitOnError)
	endpoints := fs.String("endpoints", "127.0.0.1:2379", "comma-separated endpoints")
	n := fs.Int("n", 10000, "leases to keep alive")
	ttl := fs.Int64("ttl", 10, "lease TTL in seconds")
	hold := fs.Duration("hold", 30*time.Second, "how long to keep them alive once all are granted")
	sample := fs.Int("sample", 20, "leases checked with TimeToLive at the end")
	grants := fs.Int("grant-concurrency", 64, "concurrent LeaseGrant calls")
	serverPid := fs.Int("server-pid", 0, "a server process on this machine whose CPU use over -hold is reported")
	fs.Parse(args)

	cli, err := newClient(*endpoints)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	ids := make([]clientv3.LeaseID, *n)
	var closed, grantErrors, responses int64
	start := time.Now()
	parallelFor(*n, *grants, func(i int) {
		var resp *clientv3.LeaseGrantResponse
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err = cli.Grant(gctx, *ttl)
			gcancel()
			if err == nil {
				break
			}
		}
		if err != nil {
			atomic.AddInt64(&grantErrors, 1)
			return
		}
		ids[i] = resp.ID
		ch, err := cli.KeepAlive(ctx, resp.ID)
		if err != nil {
			atomic.AddInt64(&grantErrors, 1)
			return
		}
		go func() {
			for range ch {
				atomic.AddInt64(&responses, 1)
			}
			// The channel closes when the client gives the lease up for expired
			// (or when ctx ends, which happens only after the count below).
			if ctx.Err() == nil {
				atomic.AddInt64(&closed, 1)
			}
		}()
	})
	granted := time.Since(start)
	progress("granted %d leases in %v (%d errors); holding %v", *n, granted, grantErrors, *hold)
	cpuBefore := cpuSeconds(*serverPid)
	holdStart := time.Now()
	deadline := holdStart.Add(*hold)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		progress("closed %d, keep-alive responses %d", atomic.LoadInt64(&closed), atomic.LoadInt64(&responses))
	}
	closedAtEnd := atomic.LoadInt64(&closed)
	serverCPU := -1.0
	if *serverPid != 0 {
		serverCPU = 100 * (cpuSeconds(*serverPid) - cpuBefore) / time.Since(holdStart).Seconds()
	}
	alive, checked := 0, 0
	for s := 0; s < *sample && *n > 0; s++ {
		id := ids[s*(*n)/(*sample)]
		if id == 0 {
			continue
		}
		checked++
		tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cli.TimeToLive(tctx, id)
		tcancel()
		if err == nil && resp.TTL > 0 {
			alive++
		}
	}
	return map[string]interface{}{
		"workload": "leases", "leases": *n, "ttl_s": *ttl, "hold_s": hold.Seconds(),
		"grant_errors": grantErrors, "grant_s": granted.Seconds(),
		"channels_closed": closedAtEnd, "keepalive_responses": atomic.LoadInt64(&responses),
		"sampled": checked, "sampled_alive": alive, "server_cpu_pct": serverCPU,
	}, nil
}

func watches(args []string) (map[string]interface{}, error) {
	fs := flag.NewFlagSet("watches", flag.ExitOnError)
	endpoints := fs.String("endpoints", "127.0.0.1:2379", "comma-separated endpoints")
	n := fs.Int("n", 10000, "watch creates sent back to back on one stream")
	wait := fs.Duration("wait", 60*time.Second, "how long to wait for every created answer")
	fs.Parse(args)

	cli, err := newClient(*endpoints)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// etcd's own generated stub on the client's connection: clientv3's Watch API waits for
	// each "created" before it sends the next create, pipelining clients do not.
	stream, err := pb.NewWatchClient(cli.ActiveConnection()).Watch(ctx)
	if err != nil {
		return nil, err
	}
	var created, canceled, other int64
	recvErr := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			switch {
			case resp.Created:
				if atomic.AddInt64(&created, 1) == int64(*n) {
					close(done)
				}
			case resp.Canceled:
				atomic.AddInt64(&canceled, 1)
			default:
				atomic.AddInt64(&other, 1)
			}
		}
	}()
	start := time.Now()
	sendErrors := 0
	for i := 0; i < *n; i++ {
		key := []byte(fmt.Sprintf("load-watch/%06d", i))
		req := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{
			CreateRequest: &pb.WatchCreateRequest{Key: key}}}
		if err := stream.Send(req); err != nil {
			sendErrors++
			break
		}
	}
	sent := time.Since(start)
	var streamErr string
	select {
	case <-done:
	case err := <-recvErr:
		streamErr = err.Error()
	case <-time.After(*wait):
		streamErr = "timed out waiting for created answers"
	}
	return map[string]interface{}{
		"workload": "watches", "creates": *n, "send_s": sent.Seconds(),
		"all_created_s": time.Since(start).Seconds(), "created": atomic.LoadInt64(&created),
		"canceled": atomic.LoadInt64(&canceled), "send_errors": sendErrors,
		"stream_error": streamErr,
	}, nil
}

func conns(args []string) (map[string]interface{}, error) {
	fs := flag.NewFlagSet("conns", flag.ExitOnError)
	endpoint := fs.String("endpoints", "127.0.0.1:2379", "one endpoint")
	n := fs.Int("n", 5000, "connections to open and hold")
	hold := fs.Duration("hold", 5*time.Second, "how long to hold them")
	parallel := fs.Int("parallel", 50, "connections opened at once")
	fs.Parse(args)

	target := strings.Split(*endpoint, ",")[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := make([]*grpc.ClientConn, *n)
	var opened, served, failed int64
	start := time.Now()
	parallelFor(*n, *parallel, func(i int) {
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := grpc.DialContext(dctx, target, grpc.WithInsecure(), grpc.WithBlock())
		dcancel()
		if err != nil {
			atomic.AddInt64(&failed, 1)
			return
		}
		atomic.AddInt64(&opened, 1)
		held[i] = conn
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = pb.NewKVClient(conn).Range(rctx, &pb.RangeRequest{Key: []byte("load-conn")})
		rcancel()
		if err == nil {
			atomic.AddInt64(&served, 1)
		} else {
			atomic.AddInt64(&failed, 1)
		}
	})
	openedIn := time.Since(start)
	progress("%d connections open (%d served, %d failed) in %v; holding %v", opened, served, failed, openedIn, *hold)
	time.Sleep(*hold)
	// While all of them are open: does a new client still get answers?
	fresh := "ok"
	if cli, err := newClient(target); err != nil {
		fresh = err.Error()
	} else {
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := cli.Put(pctx, "load-conn", "x"); err != nil {
			fresh = err.Error()
		}
		pcancel()
		cli.Close()
	}
	for _, c := range held {
		if c != nil {
			c.Close()
		}
	}
	return map[string]interface{}{
		"workload": "conns", "connections": *n, "opened": opened, "served": served,
		"failed": failed, "open_s": openedIn.Seconds(), "fresh_client": fresh,
	}, nil
}

// isDone tells whether the client has given the session up.
func isDone(s *concurrency.Session) bool {
	select {
	case <-s.Done():
		return true
	default:
		return false
	}
}

// A stretch of time one client held the lock (by its own clock readings).
type holding struct{ from, to time.Time }

func lockgap(args []string) (map[string]interface{}, error) {
	fs := flag.NewFlagSet("lockgap", flag.ExitOnError)
	endpoints := fs.String("endpoints", "", "comma-separated endpoints of the members")
	pidList := fs.String("pids", "", "the members' process ids, in -endpoints order")
	clients := fs.Int("clients", 5, "clients taking turns on the lock")
	ttl := fs.Int("ttl", 3, "session TTL in seconds")
	hold := fs.Duration("hold", 20*time.Millisecond, "how long a holder keeps the lock")
	fault := fs.String("fault", "stop", "stop (SIGSTOP then SIGCONT) or kill (SIGKILL; the member stays down)")
	pause := fs.Duration("pause", 5*time.Second, "how long a stopped leader stays stopped")
	settle := fs.Duration("settle", 5*time.Second, "time before the first and after each fault")
	rounds := fs.Int("rounds", 3, "faults")
	fs.Parse(args)
	eps := strings.Split(*endpoints, ",")
	var pids []int
	for _, p := range strings.Split(*pidList, ",") {
		pid, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("-pids: %v", err)
		}
		pids = append(pids, pid)
	}
	if len(pids) != len(eps) {
		return nil, fmt.Errorf("-pids needs one pid per endpoint")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var held []holding
	var sessionsLost int64
	var wg sync.WaitGroup
	for c := 0; c < *clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli, err := newClient(*endpoints)
			if err != nil {
				return
			}
			defer cli.Close()
			for ctx.Err() == nil {
				s, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				m := concurrency.NewMutex(s, "load-lockgap")
				for ctx.Err() == nil {
					// A session the client already gave up on (its keep-alives went
					// unanswered for a TTL) is replaced before the next Lock.
					if isDone(s) {
						break
					}
					if err := m.Lock(ctx); err != nil {
						break
					}
					from := time.Now()
					select {
					case <-time.After(*hold):
					case <-s.Done():
					}
					to := time.Now()
					mu.Lock()
					held = append(held, holding{from, to})
					mu.Unlock()
					if isDone(s) {
						atomic.AddInt64(&sessionsLost, 1)
					}
					uctx, ucancel := context.WithTimeout(ctx, 10*time.Second)
					err := m.Unlock(uctx)
					ucancel()
					if err != nil {
						break
					}
				}
				s.Orphan()
				s.Close()
			}
		}()
	}

	status, err := newClient(*endpoints)
	if err != nil {
		return nil, err
	}
	defer status.Close()
	leaderIndex := func() int {
		for i, ep := range eps {
			sctx, scancel := context.WithTimeout(ctx, time.Second)
			st, err := status.Status(sctx, ep)
			scancel()
			if err == nil && st.Leader == st.Header.MemberId {
				return i
			}
		}
		return -1
	}
	type window struct{ from, to time.Time }
	var windows []window
	var faults []string
	time.Sleep(*settle)
	for r := 0; r < *rounds; r++ {
		li := -1
		for i := 0; i < 50 && li < 0; i++ {
			li = leaderIndex()
			if li < 0 {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if li < 0 {
			return nil, fmt.Errorf("no leader before round %d", r)
		}
		from := time.Now()
		switch *fault {
		case "stop":
			syscall.Kill(pids[li], syscall.SIGSTOP)
			time.Sleep(*pause)
			syscall.Kill(pids[li], syscall.SIGCONT)
		case "kill":
			syscall.Kill(pids[li], syscall.SIGKILL)
		}
		faults = append(faults, eps[li])
		progress("round %d: %s %s", r, *fault, eps[li])
		time.Sleep(*settle)
		windows = append(windows, window{from, time.Now()})
		if *fault == "kill" {
			break // the caller restarts members; one kill per run
		}
	}
	cancel()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	sort.Slice(held, func(i, j int) bool { return held[i].from.Before(held[j].from) })
	var gaps []float64
	for _, w := range windows {
		// The longest stretch of the window that no holding covers, the stretch from the
		// last holding to the window's end included: a lock nobody takes again after the
		// fault is unheld until the end, not "no gap".
		longest := 0.0
		cursor := w.from
		for _, h := range held {
			if !h.to.After(cursor) {
				continue
			}
			if !h.from.Before(w.to) {
				break
			}
			if h.from.After(cursor) {
				if d := h.from.Sub(cursor).Seconds(); d > longest {
					longest = d
				}
			}
			cursor = h.to
		}
		if cursor.Before(w.to) {
			if d := w.to.Sub(cursor).Seconds(); d > longest {
				longest = d
			}
		}
		gaps = append(gaps, longest)
	}
	return map[string]interface{}{
		"workload": "lockgap", "fault": *fault, "faulted": faults, "clients": *clients,
		"ttl_s": *ttl, "pause_s": pause.Seconds(), "settle_s": settle.Seconds(), "acquisitions": len(held),
		"sessions_lost_while_holding": sessionsLost, "longest_unheld_s": gaps,
	}, nil
}
