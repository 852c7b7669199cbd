// The calls that go up the module tree, filled in by app.js before the page starts: a result's
// click opens the viewer, a search shows the chosen people and moves the viewer's position. The
// modules below (results, search) call these instead of importing the modules above them, which
// import them.

export const hooks = {
  openViewer: null, // (pos, opener): the result at pos in the viewer (viewer.js)
  updateViewerNav: null, // (): the viewer's previous/next and position, when it is open (viewer.js)
  showChosenPeople: null, // (): the person filter's chips and the person page (people.js)
};
